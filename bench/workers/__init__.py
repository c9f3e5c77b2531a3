"""Worker launchers the harness starts as processes (READY / GO / REPORT / STOP on stdin)."""
