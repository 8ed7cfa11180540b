"""The click commands (the only importer of click); no arithmetic."""
