"""The Python agents' task code: Reach's handler, Celery's app, dramatiq's actor (one module each)."""
