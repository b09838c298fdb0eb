"""Adapters that drive third-party models through xbackend ops. Each module imports its library lazily."""
