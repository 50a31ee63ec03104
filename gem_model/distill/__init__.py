"""Post-training knowledge transfer: students, teacher predictions, domain models, arms, export."""
