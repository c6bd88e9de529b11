"""Downstream evaluation (issue #55): task files, and later the in-loop scoring that reads them."""
