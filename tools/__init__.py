"""Developer tools (docs generators and checkers). Never imported by miles_core, flows or tasks."""
