"""Coldharbor's Airflow side: the spark-submit operator, the registry hook (and, in the plugin
module, the UI page). Imported by the DAGs; nothing here touches a database at import time."""
