"""fs package."""
