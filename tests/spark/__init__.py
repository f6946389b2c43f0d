"""Tests of the PySpark data source, on one local SparkSession and one broker process."""
