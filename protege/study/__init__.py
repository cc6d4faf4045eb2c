"""Studies: variants (param overrides of params.yaml) x seeds, trained from one project's shared upstream
artifacts, compared with CIs over seeds and items, and verdicts on stated claims (`protege study FILE`)."""
