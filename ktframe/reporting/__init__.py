"""Reports over runs: tables, paired differences, training curves and figures."""
