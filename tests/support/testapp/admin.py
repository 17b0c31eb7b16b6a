"""Admin of the test models: the mixin on the users' own ModelAdmins."""

from django.contrib import admin

from django_taskclaim.admin import ClaimableAdminMixin

from .models import Document, Job, Step


@admin.register(Document)
class DocumentAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["title", "kind"]
    search_fields = ["title"]


@admin.register(Job)
class JobAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["name"]
    claim_action_batch_size = 50


@admin.register(Step)
class StepAdmin(ClaimableAdminMixin, admin.ModelAdmin):
    list_display = ["name"]
