"""Coldharbor: PostgreSQL (hot) to Delta Lake (cold) change capture, maintenance and serving."""
