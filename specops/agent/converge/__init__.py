"""A run's plan and batch on the host: facts gathered in one pass (`probe`), batches staged,
validated and committed (`stage`), managed modules' bytecode (`bytecode`), and what each venv's
own interpreter says (`venvs`)."""
