from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView


class Coupon(APIView):
    """Seed 000: a wrong code is a 400 (a failure), a right one a 200."""

    ratewarden_rule = "coupon"
    ratewarden_key = staticmethod(lambda request: request.headers.get("X-User", "anonymous"))

    def post(self, request):
        if request.data.get("code") == "RIGHT":
            return Response({"redeemed": True})
        return Response({"redeemed": False}, status=400)


class Hot(APIView):
    ratewarden_rule = "hot"
    ratewarden_key = staticmethod(lambda request: "one-key")

    def get(self, request):
        return Response({"ok": True})


urlpatterns = [path("coupon", Coupon.as_view()), path("hot", Hot.as_view())]
