"""Clustering as users call it and as the classics do it: the scikit-learn-style estimator
(``estimator``), the classical algorithms written without attention (``reference``), the check of
a variant against its classic (``verify``), task generators (``tasks``) and data files (``datafile``)."""
