"""Profiles of `nandoctor run` (quick, standard, thorough), shipped as package data."""
