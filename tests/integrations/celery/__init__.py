"""effectq.celery: the eager path, configuration, canvas, real workers."""
