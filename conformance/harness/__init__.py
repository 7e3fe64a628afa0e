"""Where the checks run: a PostgreSQL server (named, Docker or embedded), scratch databases."""
