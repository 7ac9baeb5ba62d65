"""Pure onboarding logic: what a proxy asks for, and the bootstrap it gets. No I/O."""
