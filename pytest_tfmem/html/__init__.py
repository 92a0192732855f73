"""pytest-html: memory columns in its results table and each test's tfmem section in its details."""
