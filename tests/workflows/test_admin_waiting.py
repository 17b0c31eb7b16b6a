"""The admin's change page of a waiting row names the prerequisites it still waits for."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support.testapp.models import Document, Step


@pytest.mark.django_db
def test_a_waiting_rows_page_names_its_open_prerequisites(admin_client):
    done, open_ = Step.objects.create(name="done"), Step.objects.create(name="open")
    Step.objects.filter(pk=done.pk).claim_next().complete()
    waiting = Document.objects.create(title="waits", after=[done, open_])
    html = admin_client.get(reverse("admin:testapp_document_change", args=[waiting.pk]))
    text = html.content.decode()
    assert "Waiting for" in text
    assert f"testapp.Step #{open_.pk}" in text
    assert f"testapp.Step #{done.pk}" not in text
    ready = Document.objects.create(title="plain")
    page = admin_client.get(reverse("admin:testapp_document_change", args=[ready.pk]))
    assert "Waiting for" not in page.content.decode()
