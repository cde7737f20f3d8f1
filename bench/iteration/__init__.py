"""Iteration benchmark: where one engine iteration's time goes at steady decode, phase by phase."""
