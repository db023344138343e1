"""sandbox/macos package."""
