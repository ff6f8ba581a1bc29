"""Launch, supervise, diagnose, correct and restart one engine."""
