"""What may run, how much and for how long: admission, per-key rate limits, deadlines, permits.

No FastAPI here: these decide, serving/ asks and api/ renders the answer.
"""
