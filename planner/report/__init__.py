"""What a user reads: text and JSON, the terminal report, plots, explain, advice."""
