def run_job(job):
    """Handler of the integer-status Job table (a dotted-path handler)."""
    return {"name": f"{job.name} ok"}
