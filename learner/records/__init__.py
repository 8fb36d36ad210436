"""What a run records: the ticket journal, episodes, counts, time use, health, the flight recorder."""
