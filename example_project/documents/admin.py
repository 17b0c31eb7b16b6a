from django.contrib import admin

from django_taskclaim.admin import ClaimableAdminMixin

from .models import Document, ParserJob


@admin.register(Document)
class DocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["title", "batch", "pages"]
    search_fields = ["title", "batch"]


@admin.register(ParserJob)
class ParserJobAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["url"]
    search_fields = ["url"]
