"""Built-in backends. Each registers itself with gdn.resolve when gdn is imported; backends that
need optional packages load them lazily on first resolution."""
