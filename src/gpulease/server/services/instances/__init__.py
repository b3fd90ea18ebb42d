"""Instances: the unit of rental. Intent goes in here; reconcilers make it real."""
