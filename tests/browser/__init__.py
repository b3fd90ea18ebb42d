"""Browser tests. A package, so that the Chromium fixture of package scope (conftest.py) is
closed when these tests end rather than at the end of the session."""
