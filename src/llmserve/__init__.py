"""llmserve: an OpenAI-compatible gateway in front of vLLM's async engine."""

__version__ = "0.1.0"
