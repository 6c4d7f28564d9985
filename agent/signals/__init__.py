"""Signals from sampled history: sliding windows, derived rates and ratios, detectors. Pure, fake-clock friendly."""
