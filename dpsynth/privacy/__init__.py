"""The privacy layer: mechanisms, releases and accounting; it depends on nothing above it."""
