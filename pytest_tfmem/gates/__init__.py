"""CI gates: baselines of per-test peaks, the comparison against them with a tolerance, the
reports CI systems read (JSON, JUnit properties, Markdown, GitHub's step summary) and the
environment stamp that says when two runs are comparable."""
