"""A run as a process and a directory: the local launch of its ranks, the run directory
(checked writable and large enough, locked while a run uses it), the signals that stop it,
the quiet console, the checksums of its files and the one-line errors that end it."""
