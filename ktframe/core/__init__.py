"""The ground floor: errors, switches, the reference mathematics, results, validation, synthetic tasks, file output."""
