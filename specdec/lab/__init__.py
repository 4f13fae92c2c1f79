"""Instruments that measure: the bench, probes, quality, levers, profiles, plots, the recipe."""
