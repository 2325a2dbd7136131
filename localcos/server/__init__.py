"""`localcos serve`: an OpenAI-compatible HTTP API over one loaded ensemble (FastAPI + uvicorn)."""
