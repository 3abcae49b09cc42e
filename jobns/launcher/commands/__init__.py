"""The commands `jobns --help` lists, and the installed script's entry point."""
