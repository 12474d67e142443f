"""The training job perfmodel validates against and calibrates with: torch only (job.py)."""
