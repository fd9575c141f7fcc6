"""`python -m tsl.bench`: every operator of the default suite on every available target."""
