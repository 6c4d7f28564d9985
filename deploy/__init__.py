"""Deployment assets (container, Kubernetes, Helm, compose, systemd) and their generator/validator."""
