"""The directory jobwarden puts first on a job's PYTHONPATH: it holds only `sitecustomize.py`.

This file makes it a package for packaging and type checking; the job's interpreter never imports it."""
