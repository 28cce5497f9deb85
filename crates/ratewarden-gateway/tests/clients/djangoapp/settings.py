"""A Django project for tests/clients.rs: DRF views throttled by the
gateway through the `ratewarden` package, settled by its middleware.
Seed 000's coupon freeze is the three lines marked below."""

import os

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "djangoapp.urls"
INSTALLED_APPS = ["rest_framework"]
DATABASES = {}
USE_TZ = True
LOGGING = {
    "version": 1,
    "handlers": {"err": {"class": "logging.StreamHandler"}},
    "loggers": {"ratewarden": {"handlers": ["err"], "level": "WARNING"}},
}

# Seed 000's coupon freeze: these three.
RATEWARDEN = {"url": os.environ["RATEWARDEN_URL"], "token": os.environ.get("RATEWARDEN_TOKEN")}
MIDDLEWARE = ["ratewarden.django.SettleMiddleware"]
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["ratewarden.drf.RatewardenThrottle"],
    # (No users in this test project.)
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}
