"""The search over GPU counts and layouts, and the fastest layout per GPU count."""
