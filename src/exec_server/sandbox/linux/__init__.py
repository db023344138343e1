"""sandbox/linux package."""
