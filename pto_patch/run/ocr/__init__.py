"""OCR pages: the pages and their truth, the reading tasks and their scoring, saved answers, and
`verify --ocr` / `bench --ocr` with their reports and plot."""
