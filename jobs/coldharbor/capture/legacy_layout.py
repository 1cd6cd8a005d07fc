"""The migrations of the single-directory layout (every file directly in sql/, functions included), as
they were when the layout changed to sql/migrations and sql/definitions: a database they migrated is
recognised by these checksums and upgraded in place (migrate.adopt_single_directory_layout)."""

SINGLE_DIRECTORY_LAYOUT: dict[str, str] = {
    "001_registry.sql": "41cec455320c8caf0c830ae6ff0f76d087bb02f4223cee964ebf719f9c09e07e",
    "002_capture.sql": "09e3951eb4181972e04b558991950ec35808653d65f351b60e462abc7d99c296",
    "003_reports.sql": "0bcec586b4505d677e7f5ff2581c6b35775ceb0a392cefda087c338ec0cb4965",
    "004_maintenance.sql": "a20be23bd1a2da1f666128afad26699bbac4cc1f85ac6f874fa39ccbc73c3592",
    "005_entities.sql": "6035feac9b3232444ef28eeae43dcb65bdfa04f5e6917ee5a50ca45478f28b1a",
    "006_export_speed.sql": "6c425585702492431a12d078f6c9e60785a8f0307239ca323c3fd62ee5accfa6",
    "007_lake_names.sql": "bcfa2ce892f4e5f88a5abc6918f1d415b713cd9968a934e790b379eb1ecd06c9",
    "008_initial_load.sql": "84caa9d94c337f69d627ed80ee3cc605348116495b67f56e6081881b8ba95e11",
    "009_roles.sql": "fff534136ae93a01acb736b3f21fadec31bd25006ba2fbfdddda2d0cb634be08",
    "010_report_leases.sql": "b81ab94e2887cd8d5068059923da4bb1945598f439b65247419031d1811264cf",
    "011_key_identity.sql": "6fce77f7518734cce805988abed9f734531a5be3474fa4d65cfdd188f405d2e2",
    "012_commit_tokens.sql": "b929209fe34f3e24ee9520a43fbf49ef791afb9c1a2be002fae324aabe95023a",
    "013_partition_capture.sql": "b3d0681b9f98769dff21b1ede0ed0d6fa0a7d993357fd03e322b934e2c8a4df0",
    "014_rebase.sql": "25956b4082846c371f0b8fbafcf0ce48a43fe11c38b5b5c1769746ec9bdfaf25",
    "015_rebase_windows.sql": "64351210cb757efb32b0af2b147b178e0ff1eff18988657d48a6c0e1a04fe088",
    "016_rebase_dirty_and_renames.sql": "2ba97ea7248c4445f5204462ca73127ec98bd5ea315ba8a484cef868d08b82e9",
    "017_registrations.sql": "33b46820e6320db9f289de12a2d41b07387386017d380bab132abead120c78d8",
    "018_tiered_renames.sql": "8943f958f38452ebe52ac614a09945d5d79e1477c51635caf00bdba9809c1194",
    "019_evicted_keys.sql": "7c508e35822503c0be2b8cb7ed5f5dd45e18c8eb65a56175ca5da35591c216f3",
    "020_key_changes.sql": "e0edbc5f1c143481c4a8f2410e43b4268b045880384b97857f414d7e2d9fcce0",
    "021_exact_history.sql": "6e80f5b24a7b6d1f0b87a438f67c82177db910decb75efc4e03a50214ecc2af8",
    "022_freshness.sql": "34cbf3630de5752d6265215f739c9efc46bc7002d8fbe17522e977916785eef4",
    "023_health_samples.sql": "7ec1a410e7dbbd024fe9296a901d864ee6304411bda7ae5bc06a44bf53eac539",
    "024_verified_images.sql": "dbaf6a4e0fc34a1da0f4bad9712b57716371df0f6c4e2732f9dcc657b1223769",
    "025_history_kept.sql": "17120bb82c866c729a120369de2ee887fc9449dfbc7a9fc20f7799939d5d0a58",
    "026_exact_registered_again.sql": "5103b64878bff581a4f4922d5d76641109b4b3372f7f9550543e27e2c7935a4c",
    "027_lake_first.sql": "e27aecf480970ec4ee2a97e297c114a627d1276b9b4885ab5a1b38732a2daf0b",
    "028_old_images.sql": "2fb1f41791d217f0c260507fb90b593a15a979a337a50d42c2539e0ecc3b2fa0",
}

LAST_COMMIT = "4231301"   # the last commit with every migration directly in sql/
