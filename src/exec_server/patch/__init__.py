"""patch package."""
