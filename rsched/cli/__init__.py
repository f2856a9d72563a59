"""The command line: parses, calls the library, renders. No Redis logic here."""
