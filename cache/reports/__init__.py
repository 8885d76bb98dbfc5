"""What ls, show, stats, why, coverage and doctor display."""
