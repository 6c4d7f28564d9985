"""The physics floor: roofline formulas, GPU profiles, model constants and the serving plan. Pure, no I/O."""
