"""Real MariaDB servers for the sandbox and the tests."""
