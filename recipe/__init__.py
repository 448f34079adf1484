"""verl's recipe entry points, kept as thin faces so that recipe launch scripts run unchanged."""
