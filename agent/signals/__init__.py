"""Signals from sampled history: sliding windows, derived rates and ratios, detectors and their policy, and the
derive step that makes one series' frozen view per sample (series.py). Pure, fake-clock friendly."""
