"""`invoke conform`: correct answers, proven against a served profile (checks, garble detector, golden files)."""
